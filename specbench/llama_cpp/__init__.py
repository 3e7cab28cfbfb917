"""llama.cpp as a decoder under test: its binaries, GGUF copies, `llama-server` driven from the
job protocol (`decoder.py`), and its own costs from `llama-bench` (`costs.py`).

Only the binaries are external (built once by `scripts/build_llama_cpp.sh` into a cache
directory); nothing here imports llama.cpp bindings.
"""
