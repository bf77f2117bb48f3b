"""``python -m onnxaccel``: the same as the ``onnxaccel`` console script."""

from onnxaccel.cli.main import main

if __name__ == "__main__":
    main()
