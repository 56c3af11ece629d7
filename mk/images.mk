# Container images built from the root Dockerfile (operator, csi, dataplane) and
# images/test/Dockerfile (pause, fio for the real-node e2e) with buildah — no
# registry, no Docker engine — exported as OCI archives into $(CACHE)/images.
# Needs root (rootful buildah, debootstrap). See images/README.md.

IMAGES_OUT := $(CACHE)/images
IMAGE_TARGETS := operator csi dataplane pause fio fio-engine
# The fio-engine image carries the fio and the engine built on this host.
IMAGES_FIO_ENV = FIO_BIN="$$(e2e/peers/fio-libnfs.sh)" FIO_ENGINE_SO=$(FIO_ENGINE)

SETUP_TARGETS += setup-images
BUILD_TARGETS += images
TEST_TARGETS += test-images

.PHONY: setup-images images test-images $(addprefix image-,$(IMAGE_TARGETS))
setup-images: ## buildah, debootstrap, runc (apt; idempotent)
	scripts/apt-ensure.sh buildah debootstrap runc fuse-overlayfs uidmap golang-github-containers-common

images: setup-images build-fio-engine ## build all six images with buildah; OCI archives in $(CACHE)/images
	IMAGES_OUT=$(IMAGES_OUT) $(IMAGES_FIO_ENV) images/build.sh all

# A static pattern rule: a plain pattern rule listed in .PHONY is never used.
$(addprefix image-,$(IMAGE_TARGETS)): image-%: setup-images ## build one image (image-operator, image-dataplane, ...)
	$(if $(filter fio-engine,$*),$(MAKE) --no-print-directory build-fio-engine)
	IMAGES_OUT=$(IMAGES_OUT) $(IMAGES_FIO_ENV) images/build.sh $*

test-images: images ## build the images, then check each: OCI archive, entrypoint runs inside, users, size
	IMAGES_OUT=$(IMAGES_OUT) images/check.sh
