"""The gateway layer on ASGI: calls, replies, the gateway and the listener.

hypercorn's rarely needed protocol modules are deferred here, before any module of this
package imports hypercorn (``protocols``)."""

from blazar.web.asgi import protocols

protocols.defer()
