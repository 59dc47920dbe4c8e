"""Serving-time schedules built on the API: chunked prefill and cascade attention over a shared prefix."""
