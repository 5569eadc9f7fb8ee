"""planc-powersgd: PowerSGD gradient compression as a planc strategy plugin (see ``strategy``)."""

__version__ = "0.1.0"
