"""Importing another system\x27s fleet files (llmao) into a fleetllm repository."""
