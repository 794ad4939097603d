"""`whale report`: the paper's comparison, drawn from the runs in one or more stores.

- :mod:`whale.report.source` reads runs through the store client (local folder or S3);
- :mod:`whale.report.series` (pure) lays each run's wire records on the rollouts and steps axes;
- :mod:`whale.report.paper` holds the paper's Table 1, shown beside a matching run;
- :mod:`whale.report.figures` draws with matplotlib (Agg, headless; the ``plot`` extra);
- :mod:`whale.report.page` makes the summary table, the self-contained HTML page and the JSON;
- :mod:`whale.report.output` writes the files; :mod:`whale.report.cli` is the command.
"""

from whale.report.output import OutputFormat, write_report
from whale.report.series import RunRecords, RunSeries, build_series
from whale.report.source import ReportError, load_runs, load_series, read_run

__all__ = [
    "OutputFormat",
    "ReportError",
    "RunRecords",
    "RunSeries",
    "build_series",
    "load_runs",
    "load_series",
    "read_run",
    "write_report",
]
