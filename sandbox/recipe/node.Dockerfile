# The sandbox node image where a Debian base image can be pulled (elsewhere debootstrap
# builds the same recipe: node.packages, node-setup.sh, node-init.sh). Classic builder.
ARG BASE=debian:bookworm
FROM ${BASE}
COPY node.packages node-setup.sh node-init.sh /tmp/recipe/
# node-init first: node-setup.sh empties /tmp.
RUN install -m 0755 /tmp/recipe/node-init.sh /usr/local/sbin/ddpfleet-node-init \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        $(grep -v '^#' /tmp/recipe/node.packages) \
    && sh /tmp/recipe/node-setup.sh
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/sbin/ddpfleet-node-init"]
