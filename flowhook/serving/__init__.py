"""What the two HTTP faces, the API (:mod:`flowhook.api`) and the pages (:mod:`flowhook.web`),
share, one layer below both: the app's services as a dependency, and a run's live stream.
Neither face imports the other; :mod:`flowhook.app` composes them."""
