# The Debian package: `cpack -G DEB` in the build directory, or scripts/package.sh. It holds the
# install tree (cmake/Install.cmake) under /usr. Depends is computed by dpkg-shlibdeps from the
# binaries' NEEDED libraries, so installing it pulls exactly the runtime libraries (libfmt9,
# libdnnl2, ...), never a -dev package; plus libssl3, which is loaded at run time.
#
# CUDA: the CUDA libraries here are not Debian packages (/usr/local/cuda), so no binary in the
# package may need them: dpkg-shlibdeps would find no package to depend on and the build of the
# package fails. dtrain links no CUDA library: its CUDA backend is the plugin libdlaunch_cuda.so
# (kernels/cuda_plugin.h), loaded at run time for --device cuda|auto and built beside dtrain, but
# not installed, so the package is built from the ordinary build. Shipping the plugin is a
# separate dlaunch-cuda package's job (docs/install.md).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dlaunch)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "dlaunch")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "native torchrun replacement with a bundled distributed ResNet trainer")
# CPack puts the summary first and indents each line of this by one space.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "dlaunch starts one agent per node that meets the other agents (static, c10d-style
elastic or etcd rendezvous), hosts the job's store, starts the workers with
torchrun's environment contract and supervises them: restarts, hang detection,
no orphans, one failure report. It runs unmodified PyTorch scripts written for
torchrun, and under Slurm.
.
dtrain is the bundled data-parallel ResNet trainer (CPU build).")
set(DLAUNCH_PACKAGE_MAINTAINER "dlaunch maintainers <dlaunch@localhost>" CACHE STRING
    "The Maintainer field of the Debian package")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DLAUNCH_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # dlaunch_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# dpkg-shlibdeps sees NEEDED libraries only; libcrypto is dlopen()ed when a job token is used
# (rendezvous/tcp/libcrypto.h), so its package is named here and merged with the computed list.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libssl3")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # the symbols are most of the binaries' size
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
include(CPack)
