"""Test session settings. Two xdist workers share two cores, so each uses one torch thread: oversubscribed
threads make the many tiny tensor ops of these tests several times slower."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import their shared helpers (helpers, engine_utils, ...)
torch.set_num_threads(1)
