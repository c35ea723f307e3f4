"""The dashboard: ``stepstone ui``, a self-hosted page to see and steer runs.

Needs the ``ui`` extra (``pip install 'stepstone[ui]'``: Starlette, Jinja2, uvicorn,
python-multipart). Its templates and static files (a vendored htmx) ship in the
package: nothing is fetched from elsewhere at run time.
"""

from ._app import create_app
from ._sse import stream_endpoint

__all__ = ["create_app", "stream_endpoint"]
