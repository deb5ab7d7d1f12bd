"""The one exception the client raises for anything the server refused or
could not be reached for."""


class LorasinkError(Exception):
    """An error answer of lorasink, or no answer at all.

    status: the HTTP status (None when no answer came: code is then
        "connection_error"); code: the server's stable code
        ("adapter_not_found", "lora_rank_mismatch", ...), or "http_error"
        for an answer that was not lorasink's JSON error body;
    message, hint: the server's words; violations: every problem of a
        rejected adapter, each a dict with "code", "message", "hint" and,
        where they apply, "layer", "tensor", "axis", "expected", "got";
    violations_dropped: how many problems past 256 were not listed;
    retry_after: the Retry-After seconds of a 429 or 503, else None;
    request_id: the X-Request-Id the server answered with, for its logs.
    """

    def __init__(self, status, code, message, hint=None, violations=None, violations_dropped=0, retry_after=None,
                 request_id=None):
        self.status, self.code, self.message, self.hint = status, code, message, hint
        self.violations = list(violations or [])
        self.violations_dropped = violations_dropped
        self.retry_after, self.request_id = retry_after, request_id
        super().__init__(self._text())

    def __reduce__(self):
        # Rebuilt from its fields, so that it crosses multiprocessing.
        return (type(self), (self.status, self.code, self.message, self.hint, self.violations,
                             self.violations_dropped, self.retry_after, self.request_id))

    def _text(self):
        head = f"{self.status} {self.code}" if self.status is not None else self.code
        text = f"{head}: {self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        if len(self.violations) > 1:
            text += f" [{len(self.violations) + self.violations_dropped} violations]"
        return text

    @classmethod
    def from_reply(cls, status, body, retry_after=None, request_id=None):
        """From a reply's status and bytes: lorasink's {"error": {...}} body,
        or whatever else came (a proxy's page, libmicrohttpd's HTML)."""
        import json

        try:
            err = json.loads(body)["error"]
            return cls(status, err["code"], err.get("message", ""), err.get("hint"), err.get("violations"),
                       err.get("violations_dropped", 0), retry_after, request_id)
        except (ValueError, KeyError, TypeError):
            text = body[:200].decode("utf-8", "replace").strip()
            return cls(status, "http_error", text or f"HTTP {status} without a body", None, None, 0, retry_after,
                       request_id)
