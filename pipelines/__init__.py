"""Ready pipelines built only from dalistream's public helpers (installed as ``dalistream.pipelines``)."""
