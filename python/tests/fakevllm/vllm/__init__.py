"""A behaviour-faithful fake of vLLM for weightcache's tests.

Every module here mirrors the real module of the same import path in vLLM at
commit 28be48fa944d8c58aeffd1ab1b56e27828c6b268 (github.com/local-inference-lab/vllm,
a fork that merges upstream vllm-project/vllm), and each piece cites the real
file and line it copies. Test-only instruments that real vLLM lacks live in
vllm._fake. See ../README.md for the module map and what is simplified.
"""

VLLM_COMMIT = "28be48fa944d8c58aeffd1ab1b56e27828c6b268"

# vllm/version.py reads vllm/_version.py, written by setuptools-scm at build time.
__version__ = "0.0.0.dev0+g28be48fa9.fake"
__version_tuple__ = (0, 0, 0, "dev0", "g28be48fa9.fake")
