"""Test and demo support: run a real pipecat pipeline against the local Gemini Live server."""
