"""Draft training: data from the target itself (`data`), the differentiable training forward
(`forward`), the losses (`losses`), online target capture (`capture`) and the loop (`trainer`).
The `dspine-train` CLI (dspine_engine/cli/train.py) drives them; docs/TRAINING.md explains."""
from .data import DataGenerator, GenerationConfig, read_samples
from .draft_init import new_draft_config
from .trainer import SequenceData, TrainConfig, Trainer

__all__ = ["DataGenerator", "GenerationConfig", "read_samples", "new_draft_config",
           "SequenceData", "TrainConfig", "Trainer"]
