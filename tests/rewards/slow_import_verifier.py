"""A verifier whose module takes 3 s to import (a heavy dependency), for the reward-pool tests."""

import time

time.sleep(3.0)


def slow_to_load(prompts, completions, **_):
    return [1.0] * len(completions)
