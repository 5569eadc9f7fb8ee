NAME = "lowp_allreduce"
API_VERSION = 1
DESCRIPTION = "a second package claiming the same name"


def apply(job, options):
    pass
