"""Inside DALI: the W parallel sources and their conditional merge (:mod:`.graph`), device ops
(:mod:`.ops`), ``@pipeline_def`` and ``read`` (:mod:`.pipeline`), the worker-process watchdog
(:mod:`.watchdog`), the diagnosis of DALI's failures (:mod:`.diagnose`), and the one module that
touches DALI's and torch's internals (:mod:`.compat`). Nothing is imported here: importing
``dalistream.dali`` does not import DALI."""
