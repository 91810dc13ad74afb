"""What outlives a request: sessions written through to SQLite (``session_db``, ``session_rows``,
``session_writer``) and the Responses API's kept responses (``response_store``)."""
