"""The tools around the library: the ``creditflow`` command and what it runs.

* :mod:`creditflow.tools.cli`: the ``creditflow`` command (``top``, ``top --web``, ``certs``,
  ``serve``; also ``python -m creditflow``);
* :mod:`creditflow.tools.serve_command`: ``creditflow serve``, its options made from the settings
  table;
* :mod:`creditflow.tools.snapshot`: reading ``/metrics`` back (rates, per-task summaries, the
  bottleneck);
* :mod:`creditflow.tools.pipeline`: the pipeline as a graph, from scrapes or from a Spark
  :class:`~creditflow.spark.Monitor`'s samples;
* :mod:`creditflow.tools.web`: the page that draws it (``pipeline.html``) and its server;
* :mod:`creditflow.tools.charts`: PNG charts of recorded metrics;
* :mod:`creditflow.tools.certs`: a CA and node certificates for :class:`~creditflow.TLSConfig`.

They build on the library (``import creditflow``, and :mod:`creditflow.prometheus` for the
``/metrics`` families they read back); the library's root imports none of them, and only
:class:`creditflow.spark.Monitor` serves their pipeline page. Importing this package imports
none of its modules nor their optional dependencies (``prometheus_client``, ``rich``,
``matplotlib``, ``cryptography``).
"""
