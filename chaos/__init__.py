"""Chaos run and fuzzing (issue 12): `make chaos` (`python -m chaos`) and `make fuzz`
(`python -m chaos.fuzz`). Outside the packages: they drive a broker and clients as separate
processes and judge only what reached the wire and the files."""
