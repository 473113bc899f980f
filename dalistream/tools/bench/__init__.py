"""``dalistream bench``: every system timed by the same code in fresh processes (:mod:`.runner`,
:mod:`.peers`), whole process trees sampled for memory and CPU (:mod:`.monitor`), and the cost of
the merge alone (:mod:`.merge`)."""
