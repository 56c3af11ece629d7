# Container images built from the root Dockerfile (operator, csi, dataplane) and
# images/test/Dockerfile (pause, fio for the real-node e2e) with buildah — no
# registry, no Docker engine — exported as OCI archives into $(CACHE)/images.
# Needs root (rootful buildah, debootstrap). See images/README.md.

IMAGES_OUT := $(CACHE)/images
IMAGE_TARGETS := operator csi dataplane pause fio

SETUP_TARGETS += setup-images
BUILD_TARGETS += images
TEST_TARGETS += test-images

.PHONY: setup-images images test-images $(addprefix image-,$(IMAGE_TARGETS))
setup-images: ## buildah, debootstrap, runc (apt; idempotent)
	scripts/apt-ensure.sh buildah debootstrap runc fuse-overlayfs uidmap golang-github-containers-common

images: setup-images ## build all five images with buildah; OCI archives in $(CACHE)/images
	IMAGES_OUT=$(IMAGES_OUT) images/build.sh all

# A static pattern rule: a plain pattern rule listed in .PHONY is never used.
$(addprefix image-,$(IMAGE_TARGETS)): image-%: setup-images ## build one image (image-operator, image-dataplane, ...)
	IMAGES_OUT=$(IMAGES_OUT) images/build.sh $*

test-images: images ## build the images, then check each: OCI archive, entrypoint runs inside, users, size
	IMAGES_OUT=$(IMAGES_OUT) images/check.sh
