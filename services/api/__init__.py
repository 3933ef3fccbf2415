"""The OpenAI-compatible HTTP API: publishes tasks and streams their events back."""
