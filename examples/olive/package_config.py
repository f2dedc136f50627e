"""Writes Olive's package configuration with ``RMSNormFusion`` added (to stdout, or to the file named), for
``olive run --package-config FILE``; ``package_config()`` is the same as a dict, for ``olive.workflows.run``."""

from __future__ import annotations

import json
import sys

from olive.package_config import OlivePackageConfig


def package_config() -> dict:
    with open(OlivePackageConfig.get_default_config_path()) as file:
        config = json.load(file)
    config["passes"]["RMSNormFusion"] = {
        "module_path": "rmsnorm_fusion.RMSNormFusion",
        "supported_providers": ["*"],
        "supported_accelerators": ["*"],
        "supported_precisions": ["*"],
        "supported_algorithms": [],
        "supported_quantization_encodings": [],
    }
    return config


if __name__ == "__main__":
    text = json.dumps(package_config(), indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as file:
            file.write(text + "\n")
    else:
        print(text)
