# -DDLAUNCH_SANITIZE=address,undefined (or thread) instruments every target.
set(DLAUNCH_SANITIZE "" CACHE STRING "Sanitizers to enable, e.g. address,undefined")
if(DLAUNCH_SANITIZE)
  add_compile_options(-fsanitize=${DLAUNCH_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${DLAUNCH_SANITIZE})
endif()
