"""Importing another system\x27s fleet files (llmao) into an fleetllm repository."""
