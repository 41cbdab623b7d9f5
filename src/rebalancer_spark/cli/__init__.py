"""``rebalancer-spark``: the operator's view of a group and of its audit trail.

    rebalancer-spark status      --group G [--backend URL] [--json]
    rebalancer-spark members     --group G [--backend URL] [--json]
    rebalancer-spark assignments --group G [--backend URL] [--json]
    rebalancer-spark audit verify  PATH [--output TABLE] [--group G] [--tolerance S] [--json]
    rebalancer-spark audit history PATH [--group G] [--resource R] [--since T] [--json]
    rebalancer-spark history --audit PATH [--group G] [--resource R] [--since T] [--json]
    rebalancer-spark audit timeline PATH --out FILE.png [--lanes L] [--group G] [--since T] [--json]
    rebalancer-spark audit rebalances PATH [--group G] [--window S] [--since T] [--json]
    rebalancer-spark audit owners PATH [--group G] [--json]
    rebalancer-spark pause|resume|rebalance|reset --group G [--backend URL] [--json]
    rebalancer-spark drain MEMBER [--timeout S] | undrain MEMBER   --group G [--backend URL]
    rebalancer-spark pin RESOURCE MEMBER | unpin RESOURCE           --group G [--backend URL]
    rebalancer-spark threshold VALUE                                --group G [--backend URL]

``--backend`` defaults to the SQLite file in ``$REBALANCER_HOME`` that jobs use by default.
The reading commands only read: a SQLite file that does not exist yet is reported as an empty
group, not created. The control commands change the group's control record (see
``docs/control.md``). Exit status:

* 0: done (``status`` is informative and never fails a check; a control change that is
  already in effect is done too);
* 1: a check failed: ``audit verify`` found a resource owned by two members at once, or (with
  ``--output``) an output commit that broke a rule of the output check;
* 2: bad input (usage, URL, group, member or resource name, audit path, nothing to draw) or a
  store that cannot be reached;
* 3: refused by the group's state (``rebalance`` or ``drain`` while paused);
* 4: timed out: ``drain`` saw the member still owning resources after ``--timeout``;
* 130: interrupted (Ctrl-C).

An error is one line on standard error saying what happened and what to do; passwords in
URLs are shown as ``***``. Only the standard library and the core are imported at start-up;
the audit commands import ``deltalake`` when they run, ``audit timeline`` also matplotlib.

The modules: :mod:`.parser` (every command, its options and the function it dispatches to),
:mod:`.read_commands` (status, members, assignments over :mod:`rebalancer_spark.core.status`),
:mod:`.control_commands` (one table row per control command), :mod:`.audit_commands`,
:mod:`.render` (tables, the status report, strict JSON), :mod:`.store` (which store, whether
it exists, one read), :mod:`.exits` (exit statuses, the one-line error), :mod:`.main`.
"""

from rebalancer_spark.cli.main import main, run
from rebalancer_spark.cli.parser import build_parser

__all__ = ["build_parser", "main", "run"]

_parser = build_parser  # the name tests/test_readme.py imports
