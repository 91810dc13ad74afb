"""HTTP and stream mechanics shared by every surface: the guard in front of the app (``guard``), media URLs fetched
before a body is read (``media_urls``, ``url_fetch``), engine events onto the loop (``relay``) and slow clients
(``backpressure``)."""
