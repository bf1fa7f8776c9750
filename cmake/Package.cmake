# The Debian package: `cpack -G DEB` in the build directory, or scripts/package.sh. It holds the
# install tree (cmake/Install.cmake) under /usr. Depends is computed by dpkg-shlibdeps from the
# binaries' NEEDED libraries, so installing it pulls exactly the runtime libraries (libfmt9,
# libdnnl2, ...), never a -dev package; plus libssl3, which is loaded at run time.
#
# CUDA: the CUDA libraries here are not Debian packages (/usr/local/cuda), so nothing in the
# package may depend on them. dtrain links no CUDA library; in a CUDA build the package also
# holds the plugins libdlaunch_cuda.so and libdlaunch_nccl.so (cmake/Install.cmake), which need
# libcudart, cuBLAS, cuDNN and NCCL. dpkg-shlibdeps is shown where those are
# (CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS) and CPack runs it with --ignore-missing-info, so
# they resolve but, belonging to no package, add nothing to Depends: the package installs on a
# machine without CUDA, where dtrain finds the plugin unloadable and trains on the CPU (saying
# why). The description says what a GPU needs.
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
dtrain is the bundled data-parallel ResNet trainer. It trains on the CPU;
when the package was built with CUDA it also holds GPU plugins
(/usr/lib/dlaunch), used when NVIDIA's CUDA 13 runtime, cuBLAS, cuDNN 9 and
NCCL 2 libraries (not Debian packages) and a GPU are present.")
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
if(DLAUNCH_CUDA_LIBRARY_DIRS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${DLAUNCH_CUDA_LIBRARY_DIRS})
endif()
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)  # the symbols are most of the binaries' size
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/package)
include(CPack)
