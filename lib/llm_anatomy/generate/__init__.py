"""Stage 3, notebooks 05-06 (Generation): choosing tokens, the one decoding loop (prefill, decode_step), a session, chat."""
