"""Install the three rooms under one import namespace, `zerolayer`.

The repository keeps the fixed top-level layout (bpf/, daemon/, gpu/); package_dir maps
each directory into `zerolayer.*` so nothing generic (`gpu`, `daemon`) lands in
site-packages. `zerolayer` itself is an implicit namespace package.
"""
from setuptools import setup

ROOMS = {"bpf": "bpf", "daemon": "daemon", "gpu": "gpu"}
SUBPACKAGES = ["gpu.ops", "gpu.cuda"]

package_dir = {f"zerolayer.{name}": path for name, path in ROOMS.items()}
package_dir.update({f"zerolayer.{sub}": sub.replace(".", "/") for sub in SUBPACKAGES})

setup(
    packages=sorted(package_dir),
    package_dir=package_dir,
    package_data={"zerolayer.bpf": ["*.c", "*.h"]},
)
