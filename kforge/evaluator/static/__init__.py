"""The static source checks: what a candidate's source may not use, read with `ast` before anything runs
(static_check.py; native code in native_source.py, hidden lookups in hidden_lookup.py, one name per
PyTorch op in op_names.py). The parent's pool, the policy's parser and the reward's structure checks call
them; no child does."""
