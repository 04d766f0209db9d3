"""Running the serving engines themselves (vLLM's offline LLM, llama.cpp through llama-cpp-python), each in its own
Python and its own process, so that `sensprof validate --engine` measures what the engine really does."""
