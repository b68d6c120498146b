"""The signed-cookie session of the login pages, free for requests that carry no cookie."""

from __future__ import annotations

from flask import Flask, Request
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface


class CookieSessionInterface(SecureCookieSessionInterface):
    """Flask's signed-cookie session, opened without building a signer when there is nothing
    to verify.

    Flask opens the session of every request, and its interface builds the itsdangerous
    serializer (key list, signer, key derivation settings) before it looks for the cookie. API
    clients send a bearer token and no cookie, so for them that work only ever produced an
    empty session: about 3 % of a serve worker's CPU per event append (py-spy, GIL samples).
    A request without the cookie gets the same empty session straight away; one with it is
    verified as before, and a session that is written is signed as before.
    """

    def open_session(self, app: Flask, request: Request) -> SecureCookieSession | None:
        if app.secret_key and not request.cookies.get(self.get_cookie_name(app)):
            return self.session_class()
        return super().open_session(app, request)
