"""`python -m grpo_fast.cli ...` (and `torchrun ... -m grpo_fast.cli train ...`): the `grpo-fast` command."""

import sys

from grpo_fast.cli import main

sys.exit(main())
