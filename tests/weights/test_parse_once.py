"""weights/parse_once.py: within one conversion a GGUF file is parsed once and the tensor-name map built once;
outside it, gguf is untouched. (That the conversion's output is unchanged is checked by test_load.py's rebuild,
whose manifest must match the files it wrote.)"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from llm_anatomy.weights.parse_once import parsed_once


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_is_parsed_once_inside_and_afresh_outside(tiny_gguf):
    original_reader, original_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with parsed_once():
        first, again = gguf.GGUFReader(tiny_gguf), gguf.GGUFReader(str(tiny_gguf))
        assert first is again and first.tensors[0].name == "token_embd.weight"
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert gguf.GGUFReader is original_reader and gguf.get_tensor_name_map is original_map
    assert gguf.GGUFReader(tiny_gguf) is not gguf.GGUFReader(tiny_gguf)


def test_gguf_is_restored_after_an_error(tiny_gguf):
    original_reader = gguf.GGUFReader
    with pytest.raises(RuntimeError, match="boom"):
        with parsed_once():
            gguf.GGUFReader(tiny_gguf)
            raise RuntimeError("boom")
    assert gguf.GGUFReader is original_reader
