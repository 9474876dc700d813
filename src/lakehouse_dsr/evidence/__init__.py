"""What a run proves and costs: the run report."""
