# `cmake --install build --prefix P`: what a user needs on a node, nothing for building.
#   P/bin/dlaunch, P/bin/dtrain                  dtrain beside dlaunch: dlaunch's default program
#                                                is found from its own path (/proc/self/exe,
#                                                launch_config.cc), so any prefix works, moved
#                                                or shared
#   P/share/doc/dlaunch/                         README.md, docs/*.md, copyright
#   P/share/doc/dlaunch/examples/                examples/ (Slurm batch scripts, PyTorch, ...)
#   P/share/man/man1/dlaunch.1, dtrain.1         from --help, when help2man is installed
#   P/share/bash-completion/completions/dlaunch  from the flag table (launcher/config/completion.h)
#   P/share/bash-completion/completions/dtrain   from dtrain --help (scripts/dtrain_completion.sh)
#   P/share/dlaunch/python/sitecustomize.py      hooks for Python workers (launcher/config/python_hooks.h)
#   P/lib/dlaunch/libdlaunch_cuda.so, libdlaunch_nccl.so  the GPU plugins (CUDA builds only),
#                                                where dtrain looks second (common/plugin.h)
# The package (cmake/Package.cmake) is this tree under /usr.
include(GNUInstallDirs)

# What the install needs built, and nothing more: scripts/package.sh builds this target, not the
# tests and benchmarks (most of a full build). So the install and cpack do not build `all`
# first: a build of this target (or of everything) comes before them.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
add_custom_target(dlaunch_installables)

install(TARGETS dlaunch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
add_dependencies(dlaunch_installables dlaunch dlaunch_completion)
install(TARGETS dtrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
add_dependencies(dlaunch_installables dtrain)

# The GPU plugins, when this build has CUDA: dtrain dlopen()s them for --device cuda|auto
# (kernels/cuda_plugin.h, worker/comm/nccl_plugin.h) and trains on the CPU when they or the CUDA
# libraries they need are missing, so they add no dependency (cmake/Package.cmake). Installed as
# P/lib/dlaunch/ (not the multiarch libdir: common/plugin.h looks in ../lib/dlaunch from dtrain).
# Their RUNPATH names the CUDA library directories of this build (cuDNN and NCCL live there
# too), as the build tree's binaries have it; elsewhere ldconfig or LD_LIBRARY_PATH finds them.
set(DLAUNCH_CUDA_LIBRARY_DIRS)
foreach(_plugin dlaunch_cuda dlaunch_nccl)
  if(TARGET ${_plugin})
    foreach(_lib ${CUDAToolkit_LIBRARY_DIR} ${DLAUNCH_CUDNN_LIB} ${DLAUNCH_NCCL_LIB})
      if(NOT IS_DIRECTORY "${_lib}")
        get_filename_component(_lib "${_lib}" DIRECTORY)
      endif()
      list(APPEND DLAUNCH_CUDA_LIBRARY_DIRS "${_lib}")
    endforeach()
    install(TARGETS ${_plugin} LIBRARY DESTINATION lib/dlaunch)
    add_dependencies(dlaunch_installables ${_plugin})
  endif()
endforeach()
list(REMOVE_DUPLICATES DLAUNCH_CUDA_LIBRARY_DIRS)
foreach(_plugin dlaunch_cuda dlaunch_nccl)
  if(TARGET ${_plugin})
    set_target_properties(${_plugin} PROPERTIES INSTALL_RPATH "${DLAUNCH_CUDA_LIBRARY_DIRS}")
  endif()
endforeach()

# CMAKE_INSTALL_DOCDIR is share/doc/${PROJECT_NAME}: share/doc/dlaunch, Debian's place.
file(GLOB _dlaunch_docs ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${_dlaunch_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
# Debian's place for the copyright and license notices (a machine-readable DEP-5 file).
install(FILES ${CMAKE_SOURCE_DIR}/cmake/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/examples/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples
  USE_SOURCE_PERMISSIONS PATTERN CMakeLists.txt EXCLUDE PATTERN __pycache__ EXCLUDE)

install(FILES ${DLAUNCH_COMPLETION_FILE}
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)

# dtrain's, generated in worker/CMakeLists.txt from its --help.
add_dependencies(dlaunch_installables dtrain_completion)
install(FILES ${DLAUNCH_DTRAIN_COMPLETION_FILE}
  DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions)

# Man pages: help2man runs each binary's --help and --version and adds docs/man/<name>.h2m
# (exit codes, environment, see also). Optional: without help2man the build says so and goes
# on, and the install has no man pages (scripts/setup.sh installs help2man).
find_program(DLAUNCH_HELP2MAN help2man)
if(DLAUNCH_HELP2MAN)
  set(_dlaunch_man_pages)
  foreach(_prog dlaunch dtrain)
    if(NOT TARGET ${_prog})
      continue()
    endif()
    set(_page ${CMAKE_BINARY_DIR}/share/man/man1/${_prog}.1)
    set(_include ${CMAKE_SOURCE_DIR}/docs/man/${_prog}.h2m)
    add_custom_command(OUTPUT ${_page}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/share/man/man1
      # --no-discard-stderr: a binary that fails to print its help fails the build loudly.
      COMMAND ${DLAUNCH_HELP2MAN} --no-info --no-discard-stderr --section=1
              --include=${_include} --output=${_page} $<TARGET_FILE:${_prog}>
      DEPENDS ${_prog} ${_include}
      COMMENT "Generating the ${_prog}(1) man page with help2man")
    list(APPEND _dlaunch_man_pages ${_page})
  endforeach()
  add_custom_target(dlaunch_man_pages ALL DEPENDS ${_dlaunch_man_pages})
  add_dependencies(dlaunch_installables dlaunch_man_pages)
  install(FILES ${_dlaunch_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(STATUS "dlaunch: help2man not found: no man pages are built or installed "
                 "(apt-get install help2man, or scripts/setup.sh)")
endif()

# dlaunch's sitecustomize for Python workers (launcher/config/python_hooks.h): found from the binary as
# <bin>/../share/dlaunch/python, so it is copied there in the build tree (build/bin/dlaunch ->
# build/share/dlaunch/python) and installed to P/share/dlaunch/python beside P/bin/dlaunch.
configure_file(${CMAKE_SOURCE_DIR}/python/dlaunch_hooks/sitecustomize.py
  ${CMAKE_BINARY_DIR}/share/dlaunch/python/sitecustomize.py COPYONLY)
install(FILES ${CMAKE_SOURCE_DIR}/python/dlaunch_hooks/sitecustomize.py
  DESTINATION ${CMAKE_INSTALL_DATADIR}/dlaunch/python)
