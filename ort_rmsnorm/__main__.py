"""``python -m ort_rmsnorm``: the ``ort-rmsnorm`` command line."""

from .cli import console_main

if __name__ == "__main__":
    console_main()
