"""Reading windows: the window plan, the reader threads and ``WindowStream``/``WindowDataset`` (numpy + torch only)."""

__all__: list[str] = []
