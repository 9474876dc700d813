"""What a run proves and costs, for machines and people: the run report (JSON, and a page with charts),
and signed certificates of completed requests."""
