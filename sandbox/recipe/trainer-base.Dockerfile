# The trainer base image where a Debian base image can be pulled (elsewhere debootstrap
# builds it from trainer-base.packages). Classic builder.
ARG BASE=debian:bookworm
FROM ${BASE}
COPY trainer-base.packages /tmp/
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $(grep -v '^#' /tmp/trainer-base.packages) \
    && rm -rf /var/lib/apt/lists/* /tmp/trainer-base.packages
ENV LANG=C.UTF-8
CMD ["/bin/bash"]
