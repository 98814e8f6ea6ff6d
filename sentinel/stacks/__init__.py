"""All-rank Python stacks (`sentinel stacks JOB`): group identical ones, show the odd ones out."""
