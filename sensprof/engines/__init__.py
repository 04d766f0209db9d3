"""Emulations of what serving engines really store, one subpackage per engine.

Each engine format is read from the engine's own source and pinned by golden fixtures made with the
engine's code (tools/vllm_golden/); the emulation functions run on plain PyTorch on any device.
"""
