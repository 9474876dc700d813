"""The verification e-mail: a one-time code, sent through the configured SMTP server."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage

from ..config import SmtpSettings


class MailError(Exception):
    """The SMTP server could not be reached or refused the message (the text names no address)."""


def send_code(smtp: SmtpSettings, to: str, request_id: str, code: str, ttl_minutes: float) -> None:
    """One message, one SMTP session. The message names the request and the code, nothing else of it."""
    message = EmailMessage()
    message["From"], message["To"] = smtp.sender, to
    message["Subject"] = f"Your verification code for privacy request {request_id}"
    message.set_content(
        f"Someone, hopefully you, asked us to act on your personal data (request {request_id}).\n\n"
        f"To confirm it is you, enter this code on the request's status page:\n\n    {code}\n\n"
        f"The code works once and for {ttl_minutes:g} minutes. If you did not ask, ignore this message: "
        "nothing happens without the code.\n")
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout_seconds) as server:
            if smtp.starttls:
                server.starttls()
            if smtp.username:
                server.login(smtp.username, smtp.password or "")
            server.send_message(message)
    except (OSError, smtplib.SMTPException) as exc:
        # The server's reply may quote the recipient: keep only the kind of failure.
        raise MailError(f"the mail server {smtp.host}:{smtp.port} {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "refused the connection"
    if isinstance(exc, TimeoutError):
        return "did not answer in time"
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        return "refused the recipient address"
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"answered {exc.smtp_code}"
    if isinstance(exc, smtplib.SMTPException):
        return f"failed ({type(exc).__name__})"
    return f"cannot be reached ({type(exc).__name__})"
