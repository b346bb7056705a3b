"""vllm/logger.py: init_logger returns a logger with the *_once helpers the
real _VllmLogger adds (logger.py: info_once/warning_once/debug_once)."""

import logging

_seen = set()


class _VllmLogger(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return msg, kwargs

    def _once(self, level, msg, *args):
        key = (level, msg, args)
        if key not in _seen:
            _seen.add(key)
            self.log(level, msg, *args)

    def debug_once(self, msg, *args, **_):
        self._once(logging.DEBUG, msg, *args)

    def info_once(self, msg, *args, **_):
        self._once(logging.INFO, msg, *args)

    def warning_once(self, msg, *args, **_):
        self._once(logging.WARNING, msg, *args)


def init_logger(name):
    return _VllmLogger(logging.getLogger(name), {})
