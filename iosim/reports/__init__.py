"""Reports over grids of requests: the sweep, the optimizer's report, the IO lower bound, and the records they save."""
