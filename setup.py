"""Build hook: generate the protobuf/gRPC Python modules from ``protos/``.

The generated files (``secureflhv/proto/*_pb2*.py``) are never committed or edited
by hand; every build or (editable) install regenerates them with grpcio-tools.
"""
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def generate_protos() -> None:
    from grpc_tools import protoc  # build-time dependency (pyproject build-system)
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted((ROOT / "protos").rglob("*.proto"))
    for proto in protos:
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT / 'protos'}",
            f"-I{include}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")


class BuildWithProtos(build_py):
    def run(self):
        generate_protos()
        super().run()


if __name__ == "__main__":  # setuptools runs this file as __main__; importing it only generates
    setup(cmdclass={"build_py": BuildWithProtos})
