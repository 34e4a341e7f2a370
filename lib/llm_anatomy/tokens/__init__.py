"""Stage 1, notebook 01 (Tokens): text -> bytes -> pre-tokenized chunks -> BPE merges -> token ids."""
