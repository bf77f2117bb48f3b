"""Worker processes that end when the process that started them ends, however it ends.

A ``concurrent.futures.ProcessPoolExecutor`` worker waits for work on a queue whose write end it holds itself, so
when its parent is SIGKILLed (or the machine's OOM killer takes it) the read never ends: the worker lives on
forever, parented to init, holding the shared-memory ring it mapped and keeping multiprocessing's resource
tracker alive too, which then never unlinks that ring. `batch`'s decode pool and `loadtest`'s load generators pass
:func:`exit_with_parent` as their pool's initializer (or call it from theirs).

It waits on multiprocessing's own parent sentinel (``multiprocessing.parent_process().sentinel``, Python >= 3.8),
a pipe whose other end only the parent holds, for the spawn and fork start methods alike. Linux's
``PR_SET_PDEATHSIG`` (serve/processes.py) is no substitute here: it fires when the *thread* that started the child
exits, and a pool starts its workers from whichever thread submits first.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from multiprocessing.connection import wait

#: The exit status of a worker whose parent died: nothing is left to report its results to.
PARENT_GONE = 3


def exit_with_parent() -> None:
    """In a multiprocessing child: end this process (``os._exit``) as soon as its parent is gone. A no-op in a
    process that multiprocessing did not start."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(PARENT_GONE)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
