"""Stage 8, notebook 11 (Behind the API): an OpenAI-compatible streaming server on the course's scheduler, and its client."""
