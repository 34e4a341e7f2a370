"""A client that goes away mid-stream: its request is cancelled and its blocks are free at the engine's next step,
as /metrics shows."""

from __future__ import annotations

from server_helpers import metrics, wait_for

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def test_a_client_that_disconnects_mid_stream_frees_its_blocks(server, client, model_id):
    cancelled = 'llm_anatomy_requests_finished_total{finish_reason="cancelled"}'
    before = metrics(server).get(cancelled, 0.0)
    stream = client.completions.create(model=model_id, prompt=COUNTING, max_tokens=500, temperature=0, stream=True)
    pieces = []
    for chunk in stream:
        pieces.append(chunk.choices[0].text)
        if len(pieces) == 5:
            break
    held = metrics(server)
    assert held["llm_anatomy_num_requests_running"] == 1 and held["llm_anatomy_kv_blocks_used"] >= 1
    stream.close()  # the client goes away
    gone = wait_for(lambda: (m := metrics(server)).get(cancelled, 0.0) == before + 1 and
                    m["llm_anatomy_num_requests_running"] == 0 and m["llm_anatomy_kv_blocks_used"] == 0, 30)
    assert gone, metrics(server)
    records = server.get("/debug/requests")
    assert '"finish_reason":"cancelled"' in records.replace(" ", "")
