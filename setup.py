"""Packaging for speclab, driven by settings.ini (nbdev 2 writes no setup.py; this one needs no pkg_resources)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

here = Path(__file__).parent
cfg = ConfigParser(delimiters=["="])
cfg.read(here / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

licenses = {"apache2": "Apache-2.0"}
statuses = ["1 - Planning", "2 - Pre-Alpha", "3 - Alpha", "4 - Beta", "5 - Production/Stable", "6 - Mature", "7 - Inactive"]
py_versions = "3.10 3.11 3.12 3.13".split()
min_python = cfg["min_python"]
lic = licenses[cfg["license"].lower()]

setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=(here / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license=lic,
    url=cfg["git_url"],
    keywords=cfg["keywords"].split(),
    classifiers=[
        "Development Status :: " + statuses[int(cfg["status"]) - 1],
        "Intended Audience :: " + cfg["audience"].title(),
        "Natural Language :: " + cfg["language"].title(),
    ] + [f"Programming Language :: Python :: {v}" for v in py_versions[py_versions.index(min_python):]],
    packages=setuptools.find_packages(include=["speclab", "speclab.*"]),
    include_package_data=True,
    package_data={"speclab": ["data/**/*"]},
    python_requires=">=" + min_python,
    install_requires=cfg.get("requirements", "").split(),
    extras_require={"instructor": cfg.get("instructor_requirements", "").split(),
                    "docs": cfg.get("docs_requirements", "").split(),
                    "dev": cfg.get("dev_requirements", "").split() + cfg.get("instructor_requirements", "").split()
                           + cfg.get("docs_requirements", "").split()},
    entry_points={
        "console_scripts": cfg.get("console_scripts", "").split(),
        "nbdev": [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d'],
    },
    zip_safe=False,
)
